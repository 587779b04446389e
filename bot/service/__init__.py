"""The service around the engine: metrics, health, systemd notify, log formats."""
