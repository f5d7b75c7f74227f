"""The polysemy stage: how well each layer's nearest neighbours agree on the sense of a
polysemous word."""
