"""``python -m sparkmq.api.cli`` is the ``sparkmq`` command."""
from . import main

main()
