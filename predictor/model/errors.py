"""The one typed error of the project: a configuration that cannot run, naming the field and the fix."""
from __future__ import annotations


class InfeasibleConfig(ValueError):
    """A configuration that cannot run, with the field at fault and the fix.

    `field` names the input (as the CLI flag / batch column spells it without
    dashes), `fix` says what would make it valid.
    """

    def __init__(self, field_name: str, problem: str, fix: str = ""):
        self.field = field_name
        self.problem = problem
        self.fix = fix
        msg = f"{field_name}: {problem}"
        if fix:
            msg += f" Fix: {fix}"
        super().__init__(msg)
