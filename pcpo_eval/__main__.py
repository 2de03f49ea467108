from pcpo_eval.cli import main

main()
