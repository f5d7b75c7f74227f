"""The labelled datasets: the catalogue of tasks (which dataset, split files, labels and metric
each one reads) and the readers of each format (CoNLL columns, SST trees, WSD XML)."""
