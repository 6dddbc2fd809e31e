"""The engine core: one scheduler for the simulator and the real engine (compiled where built: core.compiled)."""
from core.compiled import guard

guard(__name__, __path__[0])
