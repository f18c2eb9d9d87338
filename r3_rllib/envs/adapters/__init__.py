"""The field's environment standards as r3-rllib agent envs, each behind an optional extra:

- ``verifiers`` (:mod:`.verifiers_env`): a verifiers env's tasks, rolled out by verifiers' own episode machinery;
- ``openenv`` (:mod:`.openenv_env`): an OpenEnv ``Environment`` run in-process;
- ``gem`` (:mod:`.gem_env`): a GEM env (``gem.make``), string in / string out;
- ``mcp`` (:mod:`.mcp_tools`): an MCP tool server over stdio as the tools of the tool-use loop and of agent runs.

Each is a registered text env (``env: "gem"`` + ``env_config``); a missing extra is an ``ImportError`` that names
the ``pip install 'r3-rllib[...]'`` to run. Importing this package imports none of the extras.
"""
