from multihost.cli import main

main()
