"""lib/'s floor: the small pieces every tier shares, importing nothing of the project, so that no import in lib/ runs
back up from a lower tier to a higher one (`farm-studio look lib`): the error classes (errors), the number checks of
every command line (argtypes), JSON and JSON Lines files and a file's sha256 (json_files)."""
