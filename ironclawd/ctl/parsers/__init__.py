"""ironctl's argument tree, one module per command group: argparse and the standard library
only. Each command names its handler as "MODULE:FUNCTION" of ironclawd.ctl (common.add_command)."""
