#error "unused is never a target of the build"
