"""The Trace replay page's sections (pages/replay.py reads as their sequence):

  opening.py  pick and open a trace (bundled, uploaded, merged, too large to load), the run within
              a file, the replica of a fleet: one Replay the other sections read
  panels.py   the metrics panel, the engine's own clock, provenance, the fleet, live following,
              what else the trace holds, the downloads
  cursor.py   the time cursor and every view that follows it
  compare.py  compare with another trace or the simulator's prediction; how good the simulator is
"""
