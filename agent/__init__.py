"""The in-box agent: frozen into a standalone executable, runs inside the sandbox."""
