"""IronClaw host daemon: gVisor sandboxes for AI agents under systemd."""

__version__ = "0.2.0"
