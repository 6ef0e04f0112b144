from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("shop", "0002_tick"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskRun",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("label", models.CharField(max_length=200)),
                ("result_id", models.CharField(max_length=64)),
                ("attempt", models.IntegerField()),
                ("pid", models.IntegerField()),
                ("ran", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
