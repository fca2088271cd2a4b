"""kvsim: an offline, trace-driven simulator and policy lab for LLM KV-cache memory.

The data flow is: request trace -> canonical Request table -> MemoryIntent block events
(:mod:`kvsim.schema`) -> replay through tiered, paged, prefix-shared KV memory under a
placement policy -> metrics and a decision log.  Every CLI command is a thin shell over a
function in this package; see ``docs/architecture.md``.
"""

__version__ = "0.1.0"
