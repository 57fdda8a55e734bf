"""`python -m draftdoctor.cli`: the console script's command."""

from .. import _arm_early_interrupt

_arm_early_interrupt()  # the console script's package import did it; here the package's import came first

from . import entry  # noqa: E402

entry()
