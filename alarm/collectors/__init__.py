"""Sources.  One file per source; each implements :class:`alarm.collectors.base.Collector`."""
