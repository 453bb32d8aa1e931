from robocasa_shift.cli import main

main()
