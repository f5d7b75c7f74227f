"""Pretraining pieces: the LM batches (``data``) and the softmax both directions share.

Import from the modules themselves: ``data`` pulls in Lightning, ``softmax`` only torch.
"""
