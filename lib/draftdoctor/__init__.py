"""draftdoctor: find why an EAGLE-3 draft gets no acceptance once served, fix it, and prove it.

Header-only modules (checkpoint, layouts, configs, engines, coverage, findings) import no torch.
"""

__version__ = "0.1.0"
