"""Settings: every flag and keyword once, below both the CLI and the API.

``schema`` declares each setting (its flag, type, default and help) in groups; ``types`` the
value types that refuse bad input; ``layers`` reads the config files against the schema. The
CLI builds its parser from the schema (``multihost.cli.parser``), the API checks its keywords
against it, and ``multihost.planner`` turns settings into a plan for both.
"""
