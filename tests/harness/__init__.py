"""Test harnesses: things tests need from the host that the host may not provide.

`private_systemd` boots a real systemd in throw-away namespaces over an overlay of the host's
root, so integration tests and the demo get transient units and D-Bus on machines whose PID 1 is
not systemd, without touching the host's `/tmp`, `/etc` or sysctls.
"""
