"""Files sdpa-port writes beside a port: the parity tests a reviewer runs."""
