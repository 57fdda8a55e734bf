"""draftdoctor: find why an EAGLE-3 draft gets no acceptance once served, fix it, prove it."""
