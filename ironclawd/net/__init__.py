"""Network adapters of the egress broker: host-side name resolution and HTTP(S) to a pinned
address. The only code that opens connections to the outside on behalf of an agent."""
