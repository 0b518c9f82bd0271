"""The docker compose emulation: pressrun's services in containers on one bridge
network, each link shaped from its container's environment, client fleets on a
schedule, and a report (docs/emulation.md)."""
