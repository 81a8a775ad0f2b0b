"""What survives a restart: saved state, the catalog, retention and gc, leases, saved histories."""
