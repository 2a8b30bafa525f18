"""The tests of test_containment.py as attacks of the containment report."""

from __future__ import annotations

# Each test here is one attack in the containment report: (id, category, stance, title).
ATTACKS = {
    "test_only_loopback_no_route_no_dns_and_the_hosts_loopback_is_out_of_reach": (
        "net.view.loopback-only", "network", "sandbox",
        "find an interface, a route, a resolver or the host's loopback"),
    "test_host_paths_are_not_there": (
        "fs.host.paths-absent", "filesystem", "sandbox",
        "reach 12 host paths (state, admin/internal sockets, keys, runsc, netns, dbus...)"),
    "test_no_privileges_readonly_root_and_only_a_noexec_workspace": (
        "priv.identity-and-writable-places", "privileges", "sandbox",
        "hold uid 0, a group, a capability, a writable place outside /workspace, or execve there"),
    "test_the_agent_process_itself_runs_unprivileged": (
        "priv.agent-process-uid", "privileges", "sandbox", "the agent process itself runs as root"),
    "test_a_session_sees_nothing_of_another": (
        "proc.other-session", "proc", "sandbox",
        "see another session's processes, sockets or sid"),
    "test_the_kernel_is_gvisor_and_the_host_runs_only_runsc": (
        "kernel.host-kernel-visible", "kernel", "sandbox",
        "meet the host's kernel (release, version, log) or run outside runsc"),
    "test_host_user_is_turned_away_from_the_control_socket": (
        "host-users.control.connect", "host-users", "host-user",
        "say hello on a session's control socket"),
    "test_host_user_with_a_delegated_cgroup_named_like_the_unit_is_turned_away": (
        "host-users.control.spoofed-cgroup", "host-users", "host-user",
        "pass the control socket's cgroup check from a delegated cgroup named like the unit"),
    "test_host_user_cannot_read_state_enter_the_netns_or_drive_runsc": (
        "host-users.state-netns-runsc", "host-users", "host-user",
        "read the state dir or bundle, enter the netns, drive runsc"),
    "test_runsc_control_socket_is_only_in_the_sessions_netns": (
        "host-users.runsc.abstract-socket", "host-users", "host-user",
        "reach runsc's abstract control socket from the host's netns"),
    "test_admin_sockets_are_not_reachable_from_inside": (
        "sockets.admin.from-inside", "sockets", "sandbox",
        "connect to the admin sockets from inside the box"),
}  # fmt: skip
