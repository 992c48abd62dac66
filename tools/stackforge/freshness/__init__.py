"""Is this the newest? The index client, newest/bump/audit, wheel forensics."""
