"""Reference documents generated from ironctl's and ironclawd's argparse parsers and from the
config schema (``make docs``; ``make check-docs`` fails on drift): man pages, shell completion,
docs/ironctl.md and docs/config.md. Development-only: nothing at run time imports this."""
