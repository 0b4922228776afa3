from sdpa_port.cli import main

main()
