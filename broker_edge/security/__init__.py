"""Who may connect and do what: passwords, ACLs, limits and quotas, TLS."""
