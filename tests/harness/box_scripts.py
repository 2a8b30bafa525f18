"""Pieces of the scripts tests run inside the private systemd to act as a session's box."""

# Defines join_unit(unit): move this process into the unit's name=systemd cgroup, which is what
# every session socket checks (docs/development.md). Prepended to a script run with python -c.
JOIN_UNIT = r"""
def join_unit(unit):
    import os, subprocess
    main = subprocess.run(["systemctl", "show", "-P", "MainPID", unit],
                          capture_output=True, text=True, check=True).stdout.strip()
    for line in open(f"/proc/{main}/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        if ctrls == "name=systemd":
            with open(f"/sys/fs/cgroup/systemd{path}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
"""
