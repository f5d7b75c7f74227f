"""The network: the char CNN, the LSTMs, the biLM, the scalar mix, the controls' weights, and the
model's bilm-tf files."""
