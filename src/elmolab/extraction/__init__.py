"""The extract stage's library: an encoder's features of every split of a dataset, written as
``elmolab.io.features`` defines them."""
