#include <stdio.h>

int main(void) {
    printf("hello %d\n", 1);
    return 0;
}
