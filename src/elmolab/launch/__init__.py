"""What ``make`` runs around ``dvc repro``: the time estimate ``make run`` prints first and the
quick look ``make smoke`` runs in a workspace of its own."""
