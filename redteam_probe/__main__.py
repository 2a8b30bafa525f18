"""Entry point of the red-team probe; the script PyInstaller freezes (build-agent --program probe).

Absolute import on purpose: when frozen, this file runs as ``__main__`` with no parent package.
"""

from redteam_probe.main import main

raise SystemExit(main())
