"""Proofs that sit above what they prove: the differential corpus (`differential`: the replay against
the engines' own loaders), the release sweep (`sweep`: that corpus over every installed release), and
the engine agreement (`agreement`: the reference engine emulating an engine release against that
engine itself). Nothing below imports them."""
