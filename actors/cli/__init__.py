"""The ``sessionray`` command line: the entry point and its command table
(:mod:`~actors.cli.main`, ``sessionray = "actors.cli.main:main"``; commands are imported lazily),
the terminal chat (:mod:`~actors.cli.chat`) and its console-API client
(:mod:`~actors.cli.console_client`), the admin commands (:mod:`~actors.cli.control`) and
``sessionray init`` (:mod:`~actors.cli.init_config`). The top wing of ``actors``: nothing imports
it. Nothing is re-exported here, so ``sessionray --help`` stays fast.
"""

__all__ = ["main"]
"""The module the console script names."""
