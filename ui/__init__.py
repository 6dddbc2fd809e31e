"""Streamlit glue shared by the pages (pages/ holds only pages): nothing here computes a result;
every number comes from core.

  urls.py     the URL-key table (every bound widget declared once), links, presets
  present.py  a view's figures and tables: presentation mode, slides and handouts
  cache.py    caches around core, shared by the sessions of a process
  widgets.py  widgets several pages share
  fmt.py      display formatting
  heap.py     the process's startup (heap frozen, simulation workers started)
  fleet.py    the Fleet page's caches (imported from ui.fleet, not re-exported here)
  replay/     the Trace replay page's sections (imported from ui.replay.*)
"""
from ui.cache import *  # noqa: F403
from ui.fmt import *  # noqa: F403
from ui.heap import *  # noqa: F403
from ui.present import *  # noqa: F403
from ui.urls import *  # noqa: F403
from ui.widgets import *  # noqa: F403
