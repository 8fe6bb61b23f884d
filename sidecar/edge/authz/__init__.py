"""The decision service for Envoy, nginx and Kubernetes (DESIGN §13)."""
