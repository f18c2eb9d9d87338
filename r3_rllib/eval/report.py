"""`r3 report RUN -o report.html`: one self-contained HTML file to look at a run.

What it holds, all inline (no network, no files beside it, opens from an e-mail or a cluster's shared disk):

- the learning curves of the run's trials (the figure `r3 plot` draws, as inline SVG);
- the health checks (:mod:`r3_rllib.core.health`): each check's ``health/<check>`` flags in ``progress.csv``, the
  iterations where it fired, its latest measured value and threshold;
- a sample browser over the per-sample rollout records (``<trial>/samples/iter_*.parquet``, see
  :mod:`r3_rllib.rollout.records`): prompt, completion and reward of each logged sample, filtered by iteration,
  reward and grade reason, the completion's tokens shaded by their entropy or their importance weight
  (``exp(learner - behaviour)``), the value shown on hover.

Tokens are the run's tokenizer's pieces of ``response_ids`` (the tokenizer of the trial's ``model_path``); where it
cannot be loaded the ids are shown instead. A run without records or health columns gets a report without those
parts, saying why.
"""

from __future__ import annotations

import html
import io
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from r3_rllib.eval.plot import DEFAULT_METRICS, RunCurves, build_figure, find_trial_dirs, load_trial

#: Samples shown per report (the newest iterations first): the page stays a few MB at most.
DEFAULT_MAX_SAMPLES = 300
#: The file written when ``--out`` names an existing folder.
DEFAULT_REPORT_NAME = "report.html"
HEALTH_PREFIX = "health/"
SAMPLES_DIR = "samples"


def curves_svg(runs: Sequence[RunCurves], metrics: Sequence[str] = DEFAULT_METRICS) -> str:
    """The curves figure as an inline ``<svg>`` element."""
    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # a metric absent from the run is left out of the figure, by design here
        fig = build_figure(runs, metrics, optional=frozenset(metrics))
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _latest_finite(values: np.ndarray | None) -> float | None:
    if values is None:
        return None
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite[-1]) if finite.size else None


def health_rows(run: RunCurves) -> list[dict[str, Any]]:
    """One row per health check the run logged (``health/<check>``, 0/1, for the checks of
    :data:`r3_rllib.core.health.CHECK_NAMES`): the iterations where it fired, and the latest measured value and
    threshold (``health/<check>_value``, ``_threshold``)."""
    from r3_rllib.core.health import CHECK_NAMES

    iterations = run.columns.get("training_iteration", np.arange(1, len(run) + 1, dtype=np.float64))
    rows = []
    for check in CHECK_NAMES:
        flags = run.columns.get(f"{HEALTH_PREFIX}{check}")
        if flags is None:
            continue
        fired = [int(it) for it, v in zip(iterations, flags, strict=False) if np.isfinite(v) and v != 0]
        rows.append(
            {
                "check": check,
                "value": _latest_finite(run.columns.get(f"{HEALTH_PREFIX}{check}_value")),
                "threshold": _latest_finite(run.columns.get(f"{HEALTH_PREFIX}{check}_threshold")),
                "fired_at": fired,
            }
        )
    return rows


def _token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    if tokenizer is None:
        return [f"⟨{int(i)}⟩" for i in ids]
    return [tokenizer.decode([int(i)]) for i in ids]


def _trial_tokenizer(trial_dir: Path) -> Any:
    """The tokenizer of the trial's ``model_path`` (``params.json``), or None where it cannot be loaded."""
    from r3_rllib.models.hub import policy_path
    from r3_rllib.models.tiny import load_tokenizer

    try:
        params = json.loads((trial_dir / "params.json").read_text())
        return load_tokenizer(policy_path(params.get("model_path")))
    except Exception:  # a moved model folder or a hub name offline: ids instead of pieces, said on the page
        return None


def _finite_list(values: Any, n: int) -> list[float | None]:
    if values is None:
        return [None] * n
    out = [float(v) if v is not None and math.isfinite(float(v)) else None for v in values]
    return (out + [None] * n)[:n]


def sample_entries(
    trial_dir: Path, max_samples: int = DEFAULT_MAX_SAMPLES
) -> tuple[list[dict[str, Any]], str]:
    """The browser's entries (newest iterations first) and a note saying what they are or why there are none."""
    from r3_rllib.eval.samples import readable_rows

    files = sorted((trial_dir / SAMPLES_DIR).glob("iter_*.parquet"), reverse=True)
    if not files:
        return [], f"no sample records under {trial_dir / SAMPLES_DIR} (the run logged none)"
    rows, damaged = readable_rows(files, limit=max_samples)
    for line in damaged:  # the page says it too (the note below); the terminal shows it now
        warnings.warn(line, stacklevel=2)
    rows = rows[:max_samples]
    tokenizer = _trial_tokenizer(trial_dir)
    entries = []
    for row in rows:
        ids = list(row.get("response_ids") or [])
        entries.append(
            {
                "iteration": int(row["iteration"]),
                "group": str(row.get("group_id", row.get("group"))),
                "reward": float(row["reward"]),
                "correct": bool(row.get("correct")),
                "reason": row.get("grade_reason") or ("correct" if row.get("correct") else "wrong"),
                "flags": [f for f in ("replayed", "reflection", "ranked") if row.get(f)],
                "prompt": row.get("prompt_text") or "",
                "tokens": _token_pieces(tokenizer, ids),
                "entropy": _finite_list(row.get("entropies"), len(ids)),
                "is_weight": _finite_list(row.get("is_weights"), len(ids)),
            }
        )
    how = (
        "tokenizer pieces" if tokenizer is not None else "token ids (the run's tokenizer could not be loaded)"
    )
    note = f"{len(entries)} samples from {len(files)} iteration files, newest first; tokens are {how}"
    if damaged:
        note += f"; {len(damaged)} file(s) left out: " + "; ".join(damaged)
    return entries, note


_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.9em}
.fired{color:#b00;font-weight:600}.ok{color:#080}.note{color:#666;font-size:.9em}
.sample{border:1px solid #ddd;border-radius:4px;margin:8px 0;padding:6px 10px}
.meta{font-size:.85em;color:#444}.prompt{white-space:pre-wrap;color:#555;font-family:monospace;font-size:.85em}
.completion{white-space:pre-wrap;font-family:monospace;font-size:.9em;line-height:1.6}
.tok{border-radius:2px}.controls label{margin-right:14px}
"""

# The browser: filters and shading in plain JavaScript over the JSON embedded below (no library, no network).
_SCRIPT = """
const DATA = JSON.parse(document.getElementById('samples-data').textContent);
function shade(v, key) {
  if (v === null) return 'transparent';
  const a = key === 'entropy' ? Math.min(1, v / 3) : Math.min(1, Math.abs(Math.log(Math.max(v, 1e-6))) / Math.log(2));
  return key === 'entropy' ? `rgba(255,140,0,${a.toFixed(3)})` : `rgba(30,110,255,${a.toFixed(3)})`;
}
function esc(t) { const d = document.createElement('span'); d.textContent = t; return d.innerHTML; }
function render() {
  const it = document.getElementById('f-iter').value, reason = document.getElementById('f-reason').value;
  const minR = parseFloat(document.getElementById('f-minr').value), key = document.getElementById('f-shade').value;
  const out = [];
  for (const s of DATA) {
    if (it !== 'all' && String(s.iteration) !== it) continue;
    if (reason !== 'all' && s.reason !== reason) continue;
    if (!isNaN(minR) && s.reward < minR) continue;
    const toks = s.tokens.map((t, i) => `<span class="tok" title="${key} ${s[key][i] === null ? 'n/a' : s[key][i].toFixed(3)}" style="background:${shade(s[key][i], key)}">${esc(t)}</span>`).join('');
    out.push(`<div class="sample"><div class="meta">iteration ${s.iteration} · group ${esc(s.group)} · reward ${s.reward.toFixed(3)} · ${esc(s.reason)}${s.flags.length ? ' · ' + s.flags.join(', ') : ''}</div><div class="prompt">${esc(s.prompt)}</div><div class="completion">${toks}</div></div>`);
  }
  document.getElementById('samples').innerHTML = out.join('') || '<p class="note">no sample matches the filters</p>';
  document.getElementById('shown').textContent = `${out.length} of ${DATA.length} shown`;
}
function options(id, values) {
  const sel = document.getElementById(id);
  for (const v of values) { const o = document.createElement('option'); o.value = o.textContent = v; sel.appendChild(o); }
}
options('f-iter', [...new Set(DATA.map(s => String(s.iteration)))]);
options('f-reason', [...new Set(DATA.map(s => s.reason))]);
for (const id of ['f-iter', 'f-reason', 'f-minr', 'f-shade']) document.getElementById(id).addEventListener('input', render);
render();
"""

_CONTROLS = """<div class="controls">
<label>iteration <select id="f-iter"><option value="all">all</option></select></label>
<label>grade <select id="f-reason"><option value="all">all</option></select></label>
<label>reward at least <input id="f-minr" type="number" step="0.1" size="5"></label>
<label>shade by <select id="f-shade"><option value="entropy">entropy</option>
<option value="is_weight">importance weight</option></select></label> <span id="shown" class="note"></span></div>"""


def _health_html(runs: Sequence[RunCurves]) -> str:
    parts = []
    for run in runs:
        rows = health_rows(run)
        if not rows:
            parts.append(f'<p class="note">{html.escape(run.label)}: no health/* columns in this run</p>')
            continue
        cells = []
        for r in rows:
            fired = r["fired_at"]
            status = (
                f'<span class="fired">fired at {", ".join(map(str, fired[:20]))}</span>'
                if fired
                else '<span class="ok">never fired</span>'
            )
            value, limit = (("n/a" if v is None else f"{v:.4g}") for v in (r["value"], r["threshold"]))
            cells.append(
                f"<tr><td>{html.escape(r['check'])}</td><td>{value}</td><td>{limit}</td><td>{status}</td></tr>"
            )
        parts.append(
            f"<h3>{html.escape(run.label)}</h3><table id='health'><tr><th>check</th><th>latest value</th>"
            f"<th>threshold</th><th>iterations</th></tr>{''.join(cells)}</table>"
        )
    return "".join(parts)


def render_report(run_dir: str | Path, max_samples: int = DEFAULT_MAX_SAMPLES) -> str:
    """The report of the run (or trial) folder `run_dir` as one HTML string."""
    trials = find_trial_dirs(run_dir)
    runs = [load_trial(t) for t in trials]
    entries, note = sample_entries(trials[-1], max_samples)
    # "</" inside the embedded JSON would end the <script> element early: escape the slash.
    data = json.dumps(entries).replace("</", "<\\/")
    title = html.escape(Path(run_dir).resolve().name)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>r3 report: {title}</title>"
        f"<style>{_STYLE}</style></head><body><h1>r3 report: {title}</h1>"
        f"<p class='note'>{len(trials)} trial(s) under {html.escape(str(Path(run_dir).resolve()))}</p>"
        f"<h2>Curves</h2><div id='curves'>{curves_svg(runs)}</div>"
        f"<h2>Health checks</h2>{_health_html(runs)}"
        f"<h2>Samples</h2><p class='note' id='samples-note'>{html.escape(note)} "
        f"(trial {html.escape(trials[-1].name)})</p>{_CONTROLS}<div id='samples'></div>"
        f"<script type='application/json' id='samples-data'>{data}</script>"
        f"<script>{_SCRIPT}</script></body></html>"
    )


def write_report(run_dir: str | Path, out: str | Path, max_samples: int = DEFAULT_MAX_SAMPLES) -> Path:
    """Write :func:`render_report` to `out` (parents created; an existing folder gets ``report.html`` inside it);
    returns its path. The path is settled before the report is rendered, so a folder named as `out` does not end a
    finished rendering in an IsADirectoryError."""
    out = Path(out)
    if out.is_dir():
        out = out / DEFAULT_REPORT_NAME
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 0:
        # A negative count read no records file and wrote a page without samples, saying nothing.
        raise ValueError(f"--max-samples must be an integer >= 0, got {max_samples!r}")
    page = render_report(run_dir, max_samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def add_report_args(parser: Any) -> Any:
    parser.add_argument("run", help="a run folder (runs/<name>) or one trial's folder")
    parser.add_argument(
        "-o", "--out", default="report.html", help="the HTML file to write (default report.html)"
    )
    parser.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES, help="samples in the browser")
    return parser


def run_report(args: Any) -> int:
    import sys

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            path: Path | Exception = write_report(args.run, args.out, args.max_samples)
        except (OSError, ValueError) as err:  # OSError: an output that cannot be written (permissions, ...)
            path = err
    for warning in caught:  # a damaged records file: one line, not Python's warning with a source line
        if issubclass(warning.category, UserWarning):
            print(f"r3 report: warning: {warning.message}", file=sys.stderr)
        else:  # another library's (a DeprecationWarning, ...): the usual route and filters
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if isinstance(path, Exception):
        print(f"r3 report: {path}", file=sys.stderr)
        return 2
    print(f"wrote {path} (open it in a browser; it needs no network)")
    return 0
