"""How a tick runs: admit, claim, draft, post, send; leases, the loop, building stages."""
