"""The run folder: every path written or deleted stays inside it through no link (confine), files
written whole (atomic), one process per folder (lock; a compare study's shared lock: sharedlock), and
what a folder may hold, with the one deletion path of --overwrite (layout)."""
