#compdef bkctl

_bkctl_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _BKCTL_COMPLETE=complete_zsh bkctl)
}

compdef _bkctl_completion bkctl
