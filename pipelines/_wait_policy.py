"""Imported right after ``_venv`` by the stages that compute on every core alone (pretrain,
extract), before anything loads torch: their idle OpenMP threads spin between ops instead of
sleeping (``elmolab.core.openmp``; an ``OMP_WAIT_POLICY`` in the environment wins)."""

from elmolab.core.openmp import spin_idle_threads

spin_idle_threads()
