"""onnxhal.runtime: the engine (environment, loading, optimizer, partitioner, plans, sessions) and
the built-in EP libraries. Importing it provides ``hal.host_execution``'s service to EPs."""

from onnxhal.hal.host_execution import provide_host_plans
from onnxhal.runtime.providers.cpu.graph_plan import cpu_graph_plan

provide_host_plans(cpu_graph_plan)
