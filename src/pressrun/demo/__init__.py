"""``pressrun demo`` and the test bed it shares with the integration tests.

- `pressrun.demo.testbed`: the topology: the origin shapes (machines A, B and C of
  000_9aae53f3113e9bd8.txt), the command lines of the services, and `Testbed`, the
  same set-up for the integration tests;
- `pressrun.demo.processes`: child processes: `ServiceProcess` (a ``pressrun serve``
  child and the URL it listens on), the CPU burner, CPU-seconds;
- `pressrun.demo.report`: `ClientRow` and the tables the demo prints;
- `pressrun.demo.cli`: the demo's run and its ``pressrun demo`` command.
"""
