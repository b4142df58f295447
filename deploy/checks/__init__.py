"""The checks of deploy/validate.py: schema, cluster rules, kustomize and Helm builds,
Dockerfile, and the self-test."""
