"""Pure file formats shared by the daemon and ironctl (no I/O, nothing of the daemon's layers).

ironctl may import this package (it may not import ``domain``); import-linter keeps it free of
every daemon layer so that stays safe.
"""
