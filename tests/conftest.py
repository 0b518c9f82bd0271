"""Settings every test shares.

Hypothesis: the suite runs on shared, sometimes heavily loaded CI machines, so the
time a property test's examples take to generate or run is not what it checks
(performance is measured in bench/, not in timed tests). The properties and the
number of examples are unchanged; only the wall-clock health check and the
per-example deadline are off.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "pressrun",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("pressrun")
