"""The operator console's composition: state the API serves, the twin supervisor, alerts, metrics."""
