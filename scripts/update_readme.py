"""Regenerate README.md's config reference from the config class (see r3_rllib/config_reference.py)."""

from pathlib import Path

from r3_rllib.config_reference import BEGIN, END, render

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
head, rest = text.split(BEGIN, 1)
_, tail = rest.split(END, 1)
readme.write_text(f"{head}{BEGIN}\n{render()}\n{END}{tail}")
print(f"updated {readme}")
