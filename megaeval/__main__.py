"""python -m megaeval"""

from .cli import main

main()
