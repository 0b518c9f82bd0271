"""Scoring algorithms, one module each, registered by name.

Importing this package registers every algorithm; `make_algorithm(name, ...)` builds
one. See each module's docstring for the formula it implements and its source.
"""

from pressrun.balancer.algorithms import alg1, alg2, classic, headroom, mist, p2c, weighted
from pressrun.balancer.algorithms.base import (
    ScoredAlgorithm,
    ScoringAlgorithm,
    algorithm_class,
    algorithm_names,
    make_algorithm,
    register_algorithm,
)

__all__ = [
    "ScoredAlgorithm",
    "ScoringAlgorithm",
    "alg1",
    "alg2",
    "algorithm_class",
    "algorithm_names",
    "classic",
    "headroom",
    "make_algorithm",
    "mist",
    "p2c",
    "register_algorithm",
    "weighted",
]
