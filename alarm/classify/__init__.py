"""Classifiers, one per surface kind: each maps a batch's subjects to the kind's declared
surfaces (first match wins; -1 is the kind's ``unclassified``).  Each kind's module in
alarm/kinds/ names its classifier (``Kind.classifier``); the pipeline builds them from there.
What a classifier must do is ``alarm.kind.Classifier``."""
