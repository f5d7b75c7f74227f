"""The files stages hand to each other: feature files, result files, the polysemy table; each
format defined once, here."""
