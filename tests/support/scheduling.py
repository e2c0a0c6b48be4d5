"""How many tests xdist hands a worker at a time under ``-n 2`` (``tests/conftest.py`` sets ``--maxschedchunk``).

Smaller than the number of ``slow`` tests, so that both workers get some of them; large enough that most modules'
tests stay on one worker and build their module fixtures once.
"""

XDIST_CHUNK = 8
